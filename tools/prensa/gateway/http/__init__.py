"""What every HTTP route stands on: the request type and route classes the APIs' routes use
(`routing`), and the ASGI middleware the app wraps them in (limits, keys, paced answers)."""
