module github.com/lockservice/lockservice/clients/go

go 1.23
