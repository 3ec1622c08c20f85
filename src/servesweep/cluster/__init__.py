"""Cluster access: SSH and local transports, docker runtimes, images, node pools, GPU telemetry."""
