"""Client settings: one declaration, parsed from every source."""
