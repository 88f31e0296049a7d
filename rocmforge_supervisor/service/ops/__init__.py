"""Running the service: the server start and signals, the config watch, the service-info file and
the CLI's client of a running service.
"""
