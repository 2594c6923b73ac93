"""Direct transfers: clients move payload bytes at the store (see __init__)."""
