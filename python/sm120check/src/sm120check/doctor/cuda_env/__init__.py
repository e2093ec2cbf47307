"""Family `cuda_env`: the environment a fresh interpreter of the stack venv starts with."""
