"""Federation: a job's home offers it to other regions and keeps it running in one place.

Pure decision code (README.md beside this file): ``model`` (policy, config, region
views), ``messages`` (what crosses between regions), ``epochs`` (the home's record and
rules), ``holder`` (the receiving region's), ``spill`` (when and where to nominate).
"""
