"""What every request crosses first: the middleware (keys, limits, origin, body size) and the
one map from errors to HTTP answers.
"""
