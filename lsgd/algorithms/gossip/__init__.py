"""Decentralized gossip methods: D-PSGD, DecentLaM, SGP, Overlap-Local-SGD, SwarmSGD, AD-PSGD, LEAD, and
what they share (mixing rounds, virtual-time pairing)."""
