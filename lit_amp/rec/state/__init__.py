"""Training state on disk while training goes on: row tracking, snapshots, row increments.

=====================  =====================================================================
module                 holds
=====================  =====================================================================
``touched``            :class:`TouchedRows`: the rows each optimizer step changed
``snapshot``           :class:`Snapshots`: checkpoint dicts frozen at one moment, written later
``copy_on_write``      the rows of big tensors copied aside before a step changes them
``storage_writer``     a ``torch.save`` file written storage by storage
``increments``         the row-increment format and the reader of its chain
=====================  =====================================================================
"""
