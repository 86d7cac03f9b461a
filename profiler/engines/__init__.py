"""Engine adapters behind one protocol, looked up by URI scheme."""
