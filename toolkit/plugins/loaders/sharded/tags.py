"""The sharded state's manifest file name and format tag (what ``detect`` looks for), apart from
the writer so that detecting needs neither it nor the reader."""
MANIFEST = "toolkit-sharded.json"
TAG = "toolkit-sharded-state"
