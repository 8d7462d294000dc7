"""What a tree does with layer ids: explain, the draft check, the training presets, the least invasive fixes."""
