"""The adversarial suite: hypothesis properties over every agio.v1 request and over model streams.

Requests for every RPC of AgentService and SessionService are drawn from the protobuf
descriptors with random and hostile values (strategies.py), aimed at real sessions and runs
made for each example (world.py), sent to a real server on SQLite and on PostgreSQL
(harness.py), and judged by the properties in properties.py: OK or a documented status with
an ErrorInfo, never INTERNAL or UNKNOWN; one terminal event per run; valid history after.

Two hypothesis profiles (profiles.py), chosen by `AGIO_FUZZ_PROFILE`: `fast` (the default,
deterministic, part of `make test`) and `fuzz` (`make fuzz`: thousands of cases per backend,
with a summary of the cases run and the status codes seen).
"""
