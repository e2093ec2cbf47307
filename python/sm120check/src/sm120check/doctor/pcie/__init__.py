"""What the node's PCIe fabric says about GPU peer-to-peer, read without a GPU: the kernel command line,
the IOMMU (sysfs units, group types, kernel log), each NVIDIA GPU's bridge chain up to its root port, each bridge's
ACS control from `lspci -vvv`, and the `pcie_p2p` role's reboot-pending fact file.

Readers only: each module reads one source, bounded, treating every file as possibly hostile (a reader returns why
it could not read, never raises on garbage), with the sysfs root and the commands injectable (`node.read`). The
`iommu` and `pcie_acs` checks (pcie_p2p/fabric.py) judge the typed `node.PcieFacts`.
"""
