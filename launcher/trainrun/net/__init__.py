"""Networks between hosts: NICs and the identity-checked cross-host probe (nics.py), and the NIC
choice a multi-host job exports, with its cache (choice.py)."""
