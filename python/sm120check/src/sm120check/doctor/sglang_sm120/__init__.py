"""Family `sglang_sm120`: SGLang's source for SM120, and what its own communication code turns on here."""
