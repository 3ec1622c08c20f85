"""Test and benchmark helpers: the simulated engine as a subprocess, SGLang's staged bench."""
