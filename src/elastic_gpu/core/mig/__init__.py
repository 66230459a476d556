"""MIG: NVIDIA's profile table and the MIG adapter's decisions (DESIGN.md 7.3). Pure, no I/O.

- `profiles`: the profiles per card model and which may stand in for which (`compatible`);
- `substitution`: where a pending pod moves (`choose_substitute`), which moved pods go back
  (`move_back`), and which instances are free;
- `rules`: the MIGSubstitution a move is recorded in, and whether the adapter may carry it out;
- `bare`: the state machine that makes a bare pod's rule true again after any crash;
- `recarve`: the dry-run advice of a layout change that would let a pod run;
- `layout`: NVIDIA's placement rules on one card (`check_layout`, `fits_at`, `pack`);
- `cardstate`, `planner`: dynamic MIG (issue 42): the cards to carve, re-carve or merge back.
"""
