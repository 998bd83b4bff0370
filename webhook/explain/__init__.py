"""`explain trainjob NAME`: why a TrainJob is (not) running, from what the cluster says.

`gather.py` reads (get and list only, with the user's own credentials); `report.py` turns what
was read into one report and a one-line verdict (pure: no I/O).
"""
