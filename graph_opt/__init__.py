"""graph_opt."""
