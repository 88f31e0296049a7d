"""Planning a start per backend (llama, whisper, command): the registry of what each serves, and the placement host the plans use."""
