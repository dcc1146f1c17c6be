"""Plugin discovery: the hook specifications, the registry of backends, and the event payloads."""
