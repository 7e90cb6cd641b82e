"""Device profiles, the sidecar's side: the traces jobs capture, parsed here into where a step's device time went.

A job hands each capture over through a spool beside the socket; :mod:`.service` parses it in a child process and
serves the split. The child runs :mod:`.xspace`, which reads the trace (:mod:`.xplane`, the profiler's protobuf
schema) and splits each step with :mod:`.intervals`. The child's modules import nothing else of the sidecar's, and
this package imports none of its modules itself, so the child loads only what a parse needs.
"""
