"""How close to the hardware: FLOPs and bytes from operator shapes against the device's peak."""
