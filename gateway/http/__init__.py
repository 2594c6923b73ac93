"""The offload API: routes and the request context they share."""
