"""The publish path: route, place, announce."""
