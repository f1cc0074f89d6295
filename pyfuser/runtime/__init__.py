"""Runtime: NVRTC compilation with caches, kernel launch, and dispatch of a Fusion's execution."""
