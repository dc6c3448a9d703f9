"""draft-dflash and draft-dspark: a few decoder layers that propose a whole block in one forward.

    config.py   BlockConfig: the two published layouts and their config.json; fit_problem (drafter vs target)
    model.py    BlockDraftModel: the drafter's layers over parts borrowed from the target; DSpark's heads
    drafter.py  BlockDrafter: a proposal per forward, the context cache; make_block_drafter
    io.py       a drafter folder: read_config, load_block_drafter, save_block_drafter
"""
