"""Small programs that notebooks launch on several processes."""
