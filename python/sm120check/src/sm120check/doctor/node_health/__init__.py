"""Family `node_health`: each GPU's hardware (PCIe link, ECC, Xids, clocks, MIG, BAR1, processes)."""
