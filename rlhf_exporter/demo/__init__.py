"""A simulated verl job that writes real verl-format records (the demo, examples and tests)."""
