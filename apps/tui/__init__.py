"""apps/tui."""
