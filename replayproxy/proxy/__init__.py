"""The sidecar recorder: a transparent streaming reverse proxy that records request shapes."""
