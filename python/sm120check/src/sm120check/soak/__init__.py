"""`sm120check soak`: the GPU's health watched once a second while a server runs at the user's concurrency."""
