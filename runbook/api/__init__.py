"""Talking to the launched server, shared by the steps: where the API is (the endpoint and its SSH
forward), the one synchronous API client and server finder, the serving watchdog and the health rows it
reads, the request guards, and the one exact-length prompt builder."""
