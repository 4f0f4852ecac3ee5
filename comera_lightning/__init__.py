"""comera_lightning: rank-adaptive tensor-train training (CoMERA) for PyTorch Lightning."""
