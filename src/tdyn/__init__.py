"""tdyn: training dynamics of one-layer transformers (Li-Li-Risteski 2023, Tian et al. 2023, decision lists)."""

__version__ = "0.1.0"
