"""The base layer: errors, atomic files, the event log. Imports nothing of servesweep."""
