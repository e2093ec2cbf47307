"""Family `python_stack`: torch, its NCCL and libraries, the ABI of the wheels, the pinned packages."""
