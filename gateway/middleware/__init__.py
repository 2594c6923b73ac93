"""HTTP server plumbing under every route (see its __init__)."""
