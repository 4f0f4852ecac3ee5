"""Converters for optional libraries; each module registers itself with ``comera_lightning.tensorize.registry``."""
