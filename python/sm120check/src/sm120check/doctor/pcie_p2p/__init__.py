"""Family `pcie_p2p`: the IOMMU and ACS of the PCIe fabric, and a two-rank NCCL all-reduce per GPU pair."""
