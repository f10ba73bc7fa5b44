"""Dynamic partitions: stateless and batch share one fleet, nodes move as hotness changes.

Pure cores only (no I/O, no clock, no randomness they are not given); the leader's shell
feeds them and writes what they decide to the job log. Import from the modules:

    cfg = config.parse_partitions_config(yaml_text)       # or config.PartitionsConfig()
    windows = hotness.NodeWindows(cfg.window_s); windows.add(node_id, sample)
    ph = hotness.partition_hotness(cfg, name, [windows.node(n, now, cfg) for n in members])
    decision = controller.decide(cfg, facts, {name: ph, ...}, state, now)
    moves = controller.break_glass(cfg, facts, "stateless", None, now, reason)

See README.md beside this file for the vocabulary and the flow.
"""
