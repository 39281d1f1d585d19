module durablerun.local/pause

go 1.22
