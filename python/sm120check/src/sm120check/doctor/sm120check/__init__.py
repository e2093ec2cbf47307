"""Family `sm120check`: the node manifest the `sm120check` role writes."""
