"""Family `comm`: communication between the node's GPUs (peer copies, NCCL, symmetric memory, fusion)."""
