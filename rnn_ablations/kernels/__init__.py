"""The kernels: how a planned layer call is carried out on a device (loading the compiled
modules, the operators, their autograd Functions, the CUDA mechanisms).  Nothing here imports
the run layer (``rnn.py``, the plan); the run layer imports from here."""
