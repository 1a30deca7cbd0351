"""The systemd unit templates (`pulse.service`, `pulse-user.service`), shipped as package data.

Installed as `pulse.systemd`; `pulsectl systemd install` renders them.
"""
