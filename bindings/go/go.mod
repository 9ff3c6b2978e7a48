module github.com/cactus-compute/needle/bindings/go

go 1.19
