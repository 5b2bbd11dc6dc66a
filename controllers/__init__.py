"""SDN controller (os-ken / Ryu app API) that provisions lightpaths for LightPipe."""
