"""txstream's client side: the live table update model (`txstream.updates`) and a client
that mirrors a served table (`txstream.client`)."""
