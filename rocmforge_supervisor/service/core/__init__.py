"""What every room of the gateway shares and that imports no room: the gateway's state, the
route table, usage, the activity recording, the metrics, the upstream HTTP pool, logging and the
dialect adapter's shape.
"""
