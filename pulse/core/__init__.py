"""What every process shares: stdlib, pyzmq and msgspec only, so pulsed can import it
(`guarded` and `toolscan` alone use psutil, and pulsed never imports them).
"""
