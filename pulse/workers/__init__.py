"""The worker processes pulsed supervises, one module each, around one harness.

A module is named for what its process does; the process, for its role.
"""
