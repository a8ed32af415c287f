module transferconsumer

go 1.26.8

require (
	github.com/jmoiron/sqlx v1.4.0
	github.com/kelseyhightower/envconfig v1.4.0
	github.com/lib/pq v1.12.3
	github.com/rabbitmq/amqp091-go v1.16.0
)
