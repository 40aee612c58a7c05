"""Planning, pure: hosts (hosts.py) and placement (placement.py: RankCoords per rank), the per-rank env
contract (envcontract.py), the program's argv (program.py), the whole job as ProcessSpecs (spec.py) and
the one planning path launch and `--check` share (planner.py). Nothing here touches a host."""
