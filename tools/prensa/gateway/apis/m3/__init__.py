"""bge-m3's own routes: its three outputs in one call and its hybrid scores."""
