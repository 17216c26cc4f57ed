"""Development infrastructure, apart from the library: a local S3 server (SeaweedFS) and the
local services `sparring run` and the tests start."""
